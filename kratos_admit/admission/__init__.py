"""Admission, pure: an AdmissionRequest through the decisions to a response or a patch, online and offline (review); imports the domain and the decisions."""
