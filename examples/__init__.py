"""Ready-made run configs; shipped in the wheel as package data so `metricpipe demo` finds digits.yaml."""
