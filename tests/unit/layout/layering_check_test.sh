#!/usr/bin/env bash
# layering_check.sh catches includes that point the wrong way (and passes a clean tree).
set -u
check=${1:?usage: layering_check_test.sh PATH/TO/layering_check.sh}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
tree() {  # a minimal clean tree
  rm -rf "$tmp/t" && mkdir -p "$tmp/t"/{include/trellis,common,datapath/tcp,datapath/grpc,worker-lib/src,pserver}
  echo '#include "trellis/status.h"' > "$tmp/t/include/trellis/trellis.h"
  echo '#include "common/base/status.h"' > "$tmp/t/datapath/frame.h"
  echo '#include "datapath/frame.h"' > "$tmp/t/datapath/link.h"
  echo '#include <grpcpp/support/slice.h>' > "$tmp/t/datapath/grpc/frame.h"
  echo '#include <grpcpp/channel.h>' > "$tmp/t/datapath/grpc/worker_link.h"
  echo '#include <grpcpp/support/server_callback.h>' > "$tmp/t/datapath/grpc/server_link.h"
  echo '#include "datapath/link.h"' > "$tmp/t/datapath/tcp/worker_link.h"
  printf '#include "datapath/grpc/worker_link.h"\n#include "datapath/tcp/worker_link.h"\n' \
    > "$tmp/t/datapath/connect.cc"
  printf '#include "datapath/frame.h"\n#include "datapath/connect.h"\n' > "$tmp/t/worker-lib/src/w.cc"
  printf '#include "datapath/frame.h"\n#include "datapath/tcp/listener.h"\n' > "$tmp/t/pserver/p.cc"
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
expect 1 "only datapath/grpc/ knows gRPC" "gRPC in datapath/frame.h"
tree; echo '#include <grpcpp/grpcpp.h>' >> "$tmp/t/datapath/tcp/worker_link.cc"
expect 1 "datapath/tcp/worker_link.cc:1" "gRPC in the TCP link"
tree; echo '#include "datapath/tcp/wire.h"' >> "$tmp/t/datapath/link.h"
expect 1 "the transport-free interfaces know no transport" "a transport in link.h"
tree; echo '#include "datapath/grpc/frame.h"' >> "$tmp/t/datapath/tcp/worker_link.h"
expect 1 "one transport does not include another" "the TCP link including gRPC's frames"
tree; echo '#include "datapath/tcp/wire.h"' >> "$tmp/t/worker-lib/src/w.cc"
expect 1 "only through datapath/connect.h" "the worker including a transport's internals"
tree; echo '#include "datapath/tcp/admission.h"' >> "$tmp/t/pserver/p.cc"
expect 1 "pserver/p.cc:3" "the server including a transport's internals"
tree; echo '#include "pserver/slice_store.h"' >> "$tmp/t/worker-lib/src/w.cc"
expect 1 "worker-lib/src/w.cc:3" "the worker including the server"
tree; echo '#include "worker-lib/src/transport.h"' >> "$tmp/t/pserver/p.cc"
expect 1 "does not include the worker library" "the server including the worker"
tree; echo '#include "pserver/wire.h"' >> "$tmp/t/datapath/frame.h"
expect 1 "datapath/ depends on common/ only" "datapath including the server"
tree; echo '#include "worker-lib/src/x.h"' >> "$tmp/t/common/c.h"
expect 1 "common/ includes nothing" "common including the worker"
tree; echo '#include "common/base/status.h"' >> "$tmp/t/include/trellis/trellis.h"
expect 1 "the public headers include only" "a public header including an internal one"
exit $fail
