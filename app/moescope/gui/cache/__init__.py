"""The cache panel: heatmap, per-layer bars, time plots and memory, drawn from display.cache_model
by one timer.
"""
