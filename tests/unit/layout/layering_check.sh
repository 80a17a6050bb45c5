#!/usr/bin/env bash
# The layering of the source tree (docs/architecture.md#source-layout): every include points down.
#   include/trellis/  the public worker API: the standard library and trellis/ only
#   common/           nothing from the parts above it
#   datapath/         common/ and itself; only grpc_frame.*, grpc_link.* and grpc_server_link.*
#                     know gRPC
#   worker-lib/, pserver/   datapath/ and common/ below them, never each other
# Usage: layering_check.sh REPO_ROOT. Prints every include that points the wrong way; exit 1 if any.
set -u
root=${1:?usage: layering_check.sh REPO_ROOT}
cd "$root" || exit 2
bad=0
# check DIR REGEX WHY [EXCLUDE_REGEX]: no source file under DIR has an include line matching REGEX.
check() {
  local dir=$1 regex=$2 why=$3 exclude=${4:-^$}
  local hits
  hits=$(grep -rnE --include='*.h' --include='*.cc' --include='*.cu' "$regex" "$dir" | grep -vE "$exclude" || true)
  if [[ -n "$hits" ]]; then
    echo "layering: $why:"
    echo "$hits" | sed 's/^/  /'
    bad=1
  fi
}
check include/trellis '^#include "' 'the public headers include only trellis/ and the standard library' \
  '#include "trellis/'
check common '^#include "(datapath|pserver|worker-lib|scheduler|agent|launcher|operator)/' \
  'common/ includes nothing from the parts above it'
check datapath '^#include "(pserver|worker-lib|scheduler|agent|launcher|operator|trellis/v1)/' \
  'datapath/ depends on common/ only'
check datapath '^#include <grpc' 'only datapath/grpc_frame.* and grpc_link.* / grpc_server_link.* know gRPC' \
  '^datapath/grpc_(frame|link|server_link)\.(h|cc):'
check worker-lib '^#include "pserver/' 'the worker library does not include the parameter server'
check pserver '^#include "worker-lib/' 'the parameter server does not include the worker library'
if [[ $bad -eq 0 ]]; then echo "layering: every include points down"; fi
exit $bad
