"""Sends one track and one screen call with PyPI's segment-analytics-python, Segment's own
library, to ENDPOINT (the tests' HTTP server), so that whend's batches can be held against what
it sends.

Usage: segment_capture.py ENDPOINT WRITE_KEY
"""
import sys

import segment.analytics as analytics

analytics.host = sys.argv[1]
analytics.write_key = sys.argv[2]
analytics.sync_mode = True  # one POST per call, sent before the call returns
analytics.max_retries = 0
analytics.track("u-7", "userTypesNewEmail", {"userEmail": "john.doe@example.com"})
analytics.screen("u-7", name="ChangeEmail", properties={"previous": None})
