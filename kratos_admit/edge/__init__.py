"""The edge both processes share: the API server (kubernetes_asyncio), files, logs, signals and listening; imports the domain and the decisions."""
