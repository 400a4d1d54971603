"""Hardware profile YAML files (a package so that setuptools ships them as package data)."""
