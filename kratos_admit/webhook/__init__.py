"""The webhook process: the HTTPS server, its certificates and caBundle, its metrics; imports the domain, the decisions, admission and the edge."""
