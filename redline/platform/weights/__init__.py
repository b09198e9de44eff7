"""Model weights that survive a region (#29): records on object storage, encrypted shards, keys.

Nothing is imported here on purpose: `redline.platform.snapshots` uses `records` on every
gateway process, which must not pay for boto3, `cryptography` or python-pkcs11 it never calls.

- `records`: the record-store interface and the file store (the registry's default);
  `s3store`: the same interface on S3 (versioning and Object Lock checked at start-up)
- `keys`: KEK wrappers (PKCS#11 HSM, AWS KMS); `keyring`: the DEK lifecycle
- `shards`: AES-256-GCM shards, their manifest, full and incremental verification
- `sync`: cross-region copy of shards and manifests, the DR sync table and per-region lag
- `checkpoints`: LoRA checkpoint age (RPO) from object versions
"""
