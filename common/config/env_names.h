// Every environment variable the parts of Trellis hand each other: the one place a name is
// spelled (the role of Kubeflow training-operator's envvar.go). Product code names a variable
// only through these constants; tests keep the literals (they are the user's view).
//
// Each is a char array rather than a string_view so that it works unchanged as a std::map key,
// with getenv() and in string concatenation. The Python package (worker-lib/python/trellis)
// reads a few of the same names; tests/python/test_env_names.py checks they are spelled here.
//
// Who sets -> who reads. "launcher" is trellis-launch (launcher/plan.cc), "operator" the pod
// spec it writes (operator/desired.cc), "agent" the agent for the program it starts
// (agent/agent.cc, agent/process_group.cc), "worker" libtrellis (worker-lib/src/worker_create.cc).
#pragma once

namespace trellis {

// --- The job's cluster, handed to every agent (docs/DESIGN: the environment contract) ---
// launcher, operator -> agent, scheduler (job name), worker via agent.
inline constexpr char kEnvJob[] = "TRELLIS_JOB";
// host:port of the scheduler. launcher, operator -> agent, pserver (--scheduler), worker.
inline constexpr char kEnvScheduler[] = "TRELLIS_SCHEDULER";
// "server" or "worker". launcher, operator -> agent.
inline constexpr char kEnvRole[] = "TRELLIS_ROLE";
// Replicas. launcher, operator -> agent, scheduler (--num-servers / --num-workers), pserver.
inline constexpr char kEnvNumServers[] = "TRELLIS_NUM_SERVERS";
inline constexpr char kEnvNumWorkers[] = "TRELLIS_NUM_WORKERS";
// The job token's file ("" turns authentication off). launcher, operator -> agent, scheduler,
// pserver, worker.
inline constexpr char kEnvTokenFile[] = "TRELLIS_TOKEN_FILE";
// The pod's name (default: hostname). launcher, operator (metadata.name) -> agent; the agent
// passes its own on to the program.
inline constexpr char kEnvPodName[] = "TRELLIS_POD_NAME";
// Where the others reach this pod's data ports. launcher, operator (status.podIP) -> agent ->
// pserver (--host).
inline constexpr char kEnvHost[] = "TRELLIS_HOST";
// GPUs per worker (> 1: one process per GPU). launcher, operator -> agent.
inline constexpr char kEnvGpus[] = "TRELLIS_GPUS";
// The restart policy and backoffLimit (the agent's --restart-policy / --backoff-limit win).
// User or outer run -> agent; agent -> program (the Python package reads the policy).
inline constexpr char kEnvRestartPolicy[] = "TRELLIS_RESTART_POLICY";
inline constexpr char kEnvBackoffLimit[] = "TRELLIS_BACKOFF_LIMIT";

// --- Listening addresses and ports ---
// The program's /metrics port. launcher, operator -> agent -> program (pserver, worker);
// scheduler (--metrics-port) when set in its environment.
inline constexpr char kEnvMetricsPort[] = "TRELLIS_METRICS_PORT";
// The address /metrics binds (else kEnvListenHost). launcher -> agent, pserver, scheduler, worker.
inline constexpr char kEnvMetricsHost[] = "TRELLIS_METRICS_HOST";
// The agent's own /metrics port; never passed to the program. launcher, operator -> agent.
inline constexpr char kEnvAgentMetricsPort[] = "TRELLIS_AGENT_METRICS_PORT";
// The address every listening socket binds (default 0.0.0.0). launcher (127.0.0.1), operator
// (status.podIP) -> agent, pserver, scheduler, worker (common/config/env.h ListenHost).
inline constexpr char kEnvListenHost[] = "TRELLIS_LISTEN_HOST";
// "on" | "off": the raw-TCP data path's local socket. launcher (on) -> pserver, worker.
inline constexpr char kEnvLocalSocket[] = "TRELLIS_LOCAL_SOCKET";
// The parameter server's gRPC port (--port wins). User -> pserver.
inline constexpr char kEnvPserverPort[] = "TRELLIS_PSERVER_PORT";

// --- Set by the agent for the program it starts ---
// The rank the scheduler assigned. agent -> pserver (--rank), worker.
inline constexpr char kEnvRank[] = "TRELLIS_RANK";
// How many times this rank's program has started (1, 2, ...). agent -> pserver, worker.
inline constexpr char kEnvIncarnation[] = "TRELLIS_INCARNATION";
// The processes of one worker pod (one per GPU): rank, size and name of the local group.
// agent (process_group.cc) -> worker.
inline constexpr char kEnvLocalRank[] = "TRELLIS_LOCAL_RANK";
inline constexpr char kEnvLocalSize[] = "TRELLIS_LOCAL_SIZE";
inline constexpr char kEnvLocalGroup[] = "TRELLIS_LOCAL_GROUP";
// The file the program leaves its last error in (common/process/termination_report.h). agent -> program.
inline constexpr char kEnvErrorFile[] = "TRELLIS_ERROR_FILE";
// The byte ledger's fd, and the first incarnation it counted (common/process/byte_ledger.h).
// agent -> worker.
inline constexpr char kEnvLedgerFd[] = "TRELLIS_LEDGER_FD";
// The first incarnation counted: 1 when the ledger holds every program the rank ran; more when
// the rank's earlier programs ran under another agent (a replaced pod).
inline constexpr char kEnvLedgerSince[] = "TRELLIS_LEDGER_SINCE";

// --- TLS (common/tls/tls.h): all three files or none. launcher, operator -> every process ---
inline constexpr char kEnvTlsCaFile[] = "TRELLIS_TLS_CA_FILE";
inline constexpr char kEnvTlsCertFile[] = "TRELLIS_TLS_CERT_FILE";
inline constexpr char kEnvTlsKeyFile[] = "TRELLIS_TLS_KEY_FILE";
// The name servers' certificates carry (default "trellis"). launcher, operator -> every process.
inline constexpr char kEnvTlsServerName[] = "TRELLIS_TLS_SERVER_NAME";

// --- Knobs a user (or a test) sets ---
// The agent's termination message file (default /dev/termination-log). Tests -> agent.
inline constexpr char kEnvTerminationLog[] = "TRELLIS_TERMINATION_LOG";
// debug | info | warning (warn) | error; else info. User -> every process (common/base/logging.cc).
inline constexpr char kEnvLogLevel[] = "TRELLIS_LOG_LEVEL";
// How long a worker waits for the scheduler and its peers, in ms. User -> worker.
inline constexpr char kEnvTimeoutMs[] = "TRELLIS_TIMEOUT_MS";
// "shm": keep a pod's local group on the CPU path even with NCCL. User -> worker.
inline constexpr char kEnvLocalBackend[] = "TRELLIS_LOCAL_BACKEND";
// "1": the 2-bit codec's scalar kernels even where AVX2 runs. User, benchmarks -> worker, pserver.
inline constexpr char kEnvCodecForceScalar[] = "TRELLIS_CODEC_FORCE_SCALAR";
// "0": the agent leaves a worker's malloc settings to glibc (agent/malloc_env.h). User -> agent.
inline constexpr char kEnvMallocDefaults[] = "TRELLIS_MALLOC_DEFAULTS";

}  // namespace trellis
