"""core/policies"""
