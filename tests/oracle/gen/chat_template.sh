#!/usr/bin/env bash
# Chat-template oracle: @huggingface/jinja renders of the real llama3/qwen3 templates, hand-written
# HF-style templates and feature snippets (.cache/chat_template_oracle.json).
set -euo pipefail
cd "$(dirname "$0")/../../.."
node tests/oracle/render_templates.js
