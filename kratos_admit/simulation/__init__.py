"""simulate: a trace replayed under each placement policy, on a model of kube-scheduler or a real cluster; imports the domain, the decisions, admission and the edge."""
