"""The pure core: fold, expiry, snapshot view and the select[] language. No IO here."""
