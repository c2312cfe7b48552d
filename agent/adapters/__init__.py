"""The only importers of third-party SDKs: ``kube`` (kubernetes) and ``aws`` (boto3, botocore)."""
