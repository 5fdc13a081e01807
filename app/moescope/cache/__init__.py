"""The expert cache's domain: policy as plain data, the native core's binding, budget → slots,
prefetch, residency and the sums over event rows.
"""
