"""`sparsellm serve`: an HTTP server with DeepSparse's /predict and an OpenAI-compatible API.

    sparsellm serve --task text-generation --model_path smollm2-135m-instruct   # 127.0.0.1:5543
    sparsellm serve --integration openai ./pruned50-quant     # the model id is "./pruned50-quant"
    sparsellm serve ./pruned50-quant --served-model-name pruned --kv-cache-dtype int8
    sparsellm serve --config-file config.yaml

Its options and the ServerConfig they make are `server/options.py`'s (the Ray app shares them).
"""

from __future__ import annotations

import argparse
import logging

from ..server.options import add_arguments, server_config

__all__ = ["add_arguments", "main", "server_config"]


def main(args: argparse.Namespace) -> int:
    from ..server.app import serve

    config = server_config(args)
    logging.basicConfig(level=config.log_level.upper() if config.log_level != "trace"
                        else "DEBUG", format="%(levelname)s:     %(name)s: %(message)s")
    return serve(config)
