"""Turn bodies with more structure than chat (plan → review → execute, ...). None yet."""
