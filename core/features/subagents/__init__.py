"""features/subagents"""
