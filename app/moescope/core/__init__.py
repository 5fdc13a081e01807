"""Qt-free domain code: model info, budgets, policies, traces."""
