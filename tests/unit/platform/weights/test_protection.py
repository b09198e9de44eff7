"""Which bucket settings keep it from being WORM (the start-up check, pure)."""

from __future__ import annotations

from redline.platform.weights.s3store import BucketProtection, build_protection_problems


def test_a_versioned_locked_bucket_passes() -> None:
    protection = BucketProtection("w", "Enabled", True, "GOVERNANCE", retention_days=1)
    assert build_protection_problems(protection) == [] and protection.worm


def test_each_missing_setting_is_named() -> None:
    problems = build_protection_problems(BucketProtection("w", None, False))
    assert len(problems) == 2
    assert problems[0].startswith("bucket 'w': Versioning is never enabled")
    assert problems[1].startswith("bucket 'w': Object Lock is not enabled")
    suspended = build_protection_problems(BucketProtection("w", "Suspended", True, "COMPLIANCE"))
    assert suspended == [
        "bucket 'w': Versioning is Suspended, it must be Enabled "
        "(put-bucket-versioning Status=Enabled)"
    ]
    no_rule = build_protection_problems(BucketProtection("w", "Enabled", True, None))
    assert len(no_rule) == 1 and "no default retention" in no_rule[0]
