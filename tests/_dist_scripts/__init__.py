"""Scripts run as separate rank processes by the torch backend tests (see ``_launch``)."""
