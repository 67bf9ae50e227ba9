from rlcluster_lab.rules import rules_markdown

print(rules_markdown(), end="")
