"""features/approvals"""
