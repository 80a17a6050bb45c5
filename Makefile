# The two commands a newcomer runs: `make run` and `make test`.
BUILD_DIR ?= build
BUILD_TYPE ?= RelWithDebInfo
JOBS ?= $(shell nproc)
JOB ?= examples/mlp.yaml

.PHONY: all deps configure build run test bench image clean

all: build

deps:
	@scripts/install-deps.sh

configure: deps
	@cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) >/dev/null

build: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS)

# Only the programs the demo job starts (CMake target `demo`); `make test` builds everything.
run: configure
	@cmake --build $(BUILD_DIR) --target demo -j $(JOBS)
	$(BUILD_DIR)/bin/trellis-launch $(JOB)

# KUBEBUILDER_ASSETS (the real-API-server tests, tests/k8s_real): as given, else the binaries of
# ../shared/k8s when there is one (scripts/k8s-assets.sh), else those tests skip.
test: build
	cd $(BUILD_DIR) && KUBEBUILDER_ASSETS="$${KUBEBUILDER_ASSETS:-$$($(CURDIR)/scripts/k8s-assets.sh $(abspath $(BUILD_DIR)))}" \
	  ctest --output-on-failure -j $(JOBS) --timeout 600

# The runtime image without a container engine (root; the Debian archive; its own CPU-only build
# in build/image/cmake): build/trellis-image.tar (OCI), build/trellis-image.docker.tar,
# build/image/bundle (unpacked). scripts/image.sh; docs/kubernetes.md "Build and load the image".
image: deps
	@scripts/image.sh $(BUILD_DIR)

bench: build
	@for b in $(BUILD_DIR)/bin/bench_*; do echo "== $$b"; $$b || exit 1; done

clean:
	rm -rf $(BUILD_DIR)
