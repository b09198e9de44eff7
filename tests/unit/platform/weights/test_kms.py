"""AwsKmsKeyWrapper against botocore's Stubber: no KMS server answers, but every request's
parameters are checked against the real KMS service model botocore ships."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import boto3
import pytest
from botocore.stub import Stubber

from redline.platform.weights.errors import KekNotFoundError, KeyWrapError, UnwrapError
from redline.platform.weights.keys import KMS_CONTEXT, AwsKmsKeyWrapper, build_kms_client
from redline.platform.weights.settings import KmsSettings

KEY = "arn:aws:kms:eu-west-1:111122223333:key/1234abcd-12ab-34cd-56ef-1234567890ab"


@pytest.fixture()
def stubbed() -> Iterator[tuple[AwsKmsKeyWrapper, Stubber]]:
    session = boto3.Session(
        aws_access_key_id="test", aws_secret_access_key="test", region_name="eu-west-1"
    )
    client = build_kms_client(KmsSettings(key_id=KEY, region="eu-west-1"), session)
    with Stubber(client) as stubber:
        yield AwsKmsKeyWrapper(client, KEY), stubber
        stubber.assert_no_pending_responses()


def test_wrap_and_unwrap(stubbed: tuple[AwsKmsKeyWrapper, Stubber]) -> None:
    wrapper, stubber = stubbed
    dek = secrets.token_bytes(32)
    stubber.add_response(
        "encrypt",
        {"CiphertextBlob": b"wrapped-blob", "KeyId": KEY},
        {"KeyId": KEY, "Plaintext": dek, "EncryptionContext": KMS_CONTEXT},
    )
    stubber.add_response(
        "decrypt",
        {"Plaintext": dek, "KeyId": KEY},
        {"CiphertextBlob": b"wrapped-blob", "KeyId": KEY, "EncryptionContext": KMS_CONTEXT},
    )
    assert wrapper.wrap(dek) == b"wrapped-blob"
    assert wrapper.unwrap(b"wrapped-blob") == dek
    assert wrapper.kek_id == f"kms:{KEY}"


def test_errors_are_named(stubbed: tuple[AwsKmsKeyWrapper, Stubber]) -> None:
    wrapper, stubber = stubbed
    stubber.add_client_error("encrypt", "NotFoundException", "Key not found", 400)
    stubber.add_client_error("decrypt", "InvalidCiphertextException", "bad", 400)
    stubber.add_client_error("decrypt", "AccessDeniedException", "no kms:Decrypt", 400)
    with pytest.raises(KekNotFoundError, match="key_id"):
        wrapper.wrap(secrets.token_bytes(32))
    with pytest.raises(UnwrapError, match="InvalidCiphertextException"):
        wrapper.unwrap(b"blob")
    with pytest.raises(KeyWrapError, match="AccessDeniedException: no kms:Decrypt"):
        wrapper.unwrap(b"blob")
    with pytest.raises(KeyWrapError, match="32 bytes"):
        wrapper.wrap(b"short")
