#!/usr/bin/env bash
# layering_check.sh catches includes that point the wrong way (and passes a clean tree).
set -u
check=${1:?usage: layering_check_test.sh PATH/TO/layering_check.sh}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
tree() {  # a minimal clean tree
  rm -rf "$tmp/t" && mkdir -p "$tmp/t"/{include/trellis,common,datapath,worker-lib/src,pserver}
  echo '#include "trellis/status.h"' > "$tmp/t/include/trellis/trellis.h"
  echo '#include "common/base/status.h"' > "$tmp/t/datapath/frame.h"
  echo '#include <grpcpp/support/slice.h>' > "$tmp/t/datapath/grpc_frame.h"
  echo '#include <grpcpp/channel.h>' > "$tmp/t/datapath/grpc_link.h"
  echo '#include <grpcpp/support/server_callback.h>' > "$tmp/t/datapath/grpc_server_link.h"
  echo '#include "datapath/frame.h"' > "$tmp/t/worker-lib/src/w.cc"
  echo '#include "datapath/frame.h"' > "$tmp/t/pserver/p.cc"
}
expect() {  # expect WANT_RC WANT_TEXT WHAT
  local out rc
  out=$("$check" "$tmp/t" 2>&1); rc=$?
  if [[ $rc -ne $1 || "$out" != *"$2"* ]]; then
    echo "FAIL: $3: rc $rc, output:"; echo "$out"; fail=1
  else
    echo "ok: $3"
  fi
}
tree; expect 0 "every include points down" "a clean tree passes"
tree; echo '#include <grpcpp/grpcpp.h>' >> "$tmp/t/datapath/frame.h"
expect 1 "only datapath/grpc_frame.* and grpc_link.* / grpc_server_link.* know gRPC" "gRPC in datapath/frame.h"
tree; echo '#include <grpcpp/grpcpp.h>' >> "$tmp/t/datapath/tcp_link.cc"
expect 1 "datapath/tcp_link.cc:1" "gRPC in the TCP link"
tree; echo '#include "pserver/slice_store.h"' >> "$tmp/t/worker-lib/src/w.cc"
expect 1 "worker-lib/src/w.cc:2" "the worker including the server"
tree; echo '#include "worker-lib/src/transport.h"' >> "$tmp/t/pserver/p.cc"
expect 1 "does not include the worker library" "the server including the worker"
tree; echo '#include "pserver/wire.h"' >> "$tmp/t/datapath/frame.h"
expect 1 "datapath/ depends on common/ only" "datapath including the server"
tree; echo '#include "worker-lib/src/x.h"' >> "$tmp/t/common/c.h"
expect 1 "common/ includes nothing" "common including the worker"
tree; echo '#include "common/base/status.h"' >> "$tmp/t/include/trellis/trellis.h"
expect 1 "the public headers include only" "a public header including an internal one"
exit $fail
