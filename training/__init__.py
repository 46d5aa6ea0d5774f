"""The shared-core trainer for every Hyper-SET task (`hyperset-train`)."""
