"""app/apply: changing hosts on a plan's behalf: the executor and one class per action kind."""
