"""The numerics lab: why each precision behaves as it does, measured on the device.

formats (bit layouts and ranges), demos (live rounding experiments), gradients (where
gradients and activations fall against each format's range), optrace (which dtype each
aten op ran in), advisor (a recommendation with measured reasons), lab (all of it as one
JSON dict for the report's ``numerics`` key).
"""
