"""The ``oled-moe`` command line."""
