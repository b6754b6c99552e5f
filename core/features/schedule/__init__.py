"""features/schedule"""
