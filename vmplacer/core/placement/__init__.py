"""core/placement: placing a guest: what it asks for, admission, allocation, host choice."""
