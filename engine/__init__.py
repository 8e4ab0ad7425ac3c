"""AmpScope's measurement engine. Never imports Qt."""

VERSION = "0.1.0"
