"""The reporter SDK: `ExternalReporter`, and what became of a report."""
