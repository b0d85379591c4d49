"""Decodes OTLP/HTTP request bodies (ExportLogsServiceRequest, protobuf) with PyPI's
opentelemetry-proto, OpenTelemetry's own generated code, and prints them as one JSON array in
protobuf's JSON mapping (field names as in the .proto files), so that the tests can hold what
whend sent against the specification field by field.

Usage: otlp_decode.py BODY_FILE...
"""
import json
import sys

from google.protobuf import unknown_fields
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest



def unknown(message):
    """Fields OpenTelemetry's schema does not know, in the message and every message in it."""
    count = len(unknown_fields.UnknownFieldSet(message))
    for field, value in message.ListFields():
        if field.type != FieldDescriptor.TYPE_MESSAGE:
            continue
        for m in value if field.is_repeated else [value]:
            count += unknown(m)
    return count


requests = []
for path in sys.argv[1:]:
    with open(path, "rb") as f:
        body = f.read()
    request = ExportLogsServiceRequest()
    request.ParseFromString(body)
    requests.append({
        "request": MessageToDict(request, preserving_proto_field_name=True),
        # Nothing unknown to OpenTelemetry's own schema: a misnumbered field would land here.
        "unknown_fields": unknown(request),
        "reencoded_equal": request.SerializeToString() == body,
    })
print(json.dumps(requests))
