"""Tests that load the real bundled pair (most are marked ``model``), with the quick tests of their files."""
