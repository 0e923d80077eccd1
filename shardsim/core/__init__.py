"""The ground floor: what every role imports. Imports nothing of shardsim outside ``shardsim.core``."""
