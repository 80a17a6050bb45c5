#!/usr/bin/env bash
# The layering of the source tree (docs/architecture.md#source-layout): every include points down.
#   include/trellis/  the public worker API: the standard library and trellis/ only
#   common/           nothing from the parts above it
#   datapath/         common/ and itself; each transport whole in its folder: only datapath/grpc/
#                     knows gRPC, and link.h, address.h and frame.h know no transport
#   worker-lib/, pserver/   datapath/ and common/ below them, never each other. The worker reaches
#                     the transports only through datapath/connect.h (no datapath/tcp/ or
#                     datapath/grpc/ header); the server mounts each transport's server side
#                     (datapath/tcp/listener.h, datapath/grpc/server_link.h) and the gRPC frame
#                     constants (datapath/grpc/frame.h), nothing else of them
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
check datapath '^#include <grpc' 'only datapath/grpc/ knows gRPC' '^datapath/grpc/'
check datapath '^#include "datapath/(tcp|grpc)/' 'the transport-free interfaces know no transport' \
  '^datapath/(tcp|grpc)/|^datapath/connect\.cc:'
check datapath/tcp '^#include "datapath/grpc/' 'one transport does not include another'
check datapath/grpc '^#include "datapath/tcp/' 'one transport does not include another'
check worker-lib '^#include "datapath/(tcp|grpc)/' \
  'the worker reaches a transport only through datapath/connect.h'
check pserver '^#include "datapath/(tcp|grpc)/' \
  'the server includes only the transports'"'"' server sides' \
  '#include "datapath/(tcp/listener|grpc/server_link|grpc/frame)\.h"'
check worker-lib '^#include "pserver/' 'the worker library does not include the parameter server'
check pserver '^#include "worker-lib/' 'the parameter server does not include the worker library'
if [[ $bad -eq 0 ]]; then echo "layering: every include points down"; fi
exit $bad
