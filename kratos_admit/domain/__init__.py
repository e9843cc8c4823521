"""The pure domain: Kubernetes objects as KRATOS reads them, the vocabulary, the profile, signing and configuration; imports nothing else of kratos_admit."""
