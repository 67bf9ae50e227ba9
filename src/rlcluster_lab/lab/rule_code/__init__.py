"""A rule's own code beside the decision it took (``view.show_rule``), and Tunix's lines for the
same rule, read from the installed extra (``reference_lines``)."""
