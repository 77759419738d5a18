"""Test helpers: real servers and processes, builders. No tests here."""
