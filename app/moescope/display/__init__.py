"""What the window shows, as Qt-free models: ring buffers, heatmap state, memory, what-if cells,
policy menu, fit estimate, reopened traces. Views in gui/ read them; tests check their numbers
without a widget.
"""
