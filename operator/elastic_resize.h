// Elastic jobs on Kubernetes (docs/elastic.md#on-kubernetes), and the fixed size of the others.
// spec.workers.replicas (what `kubectl scale` sets through the CRD's scale subresource) is what
// the user asks for; status.world is what the job's scheduler runs with. The pods follow the
// world, not the ask: when the two differ on a running elastic job the operator asks the
// scheduler to resize (Resize RPC), follows it (GetProgress) until the workers switched at the
// step boundary they agreed on, and only then writes the new world. A worker resized away
// finishes its last step and exits 0; its pod is deleted once it has ended. A job without
// spec.elastic keeps its world until it is next started (resumed after a suspension).
//
// status.lastResize {from, to, reason, outcome, requestTime, epoch, fromStep, doneTime, message}
// says where the latest resize stands; outcome is one of kResize*. The Resizing condition is
// True while one is under way. status.world {workers, members, epoch, fromStep, lost} is the
// world the workers train in; a worker the scheduler lost for good (NoteLostWorkers) is followed
// like a resize the operator did not ask for.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "common/job/job_spec.h"
#include "operator/job_status.h"
#include "operator/observed_pod.h"
#include "trellis/v1/scheduler.pb.h"

namespace trellis::op {

struct PlanRound;

inline constexpr char kResizingCondition[] = "Resizing";
inline constexpr char kResizePending[] = "Pending";    // asked; the workers have not switched yet
inline constexpr char kResizeDone[] = "Done";          // the workers run in the new world
inline constexpr char kResizeRefused[] = "Refused";    // outside spec.elastic, or not built (growing)
inline constexpr char kResizeAbandoned[] = "Abandoned";  // the scheduler gave it up
// status.lastResize.kind of a resize of the servers (docs/elastic.md#servers); absent: the workers'.
inline constexpr char kServersResize[] = "Servers";

// The status's lastResize is a resize of the servers.
bool ServersResize(const Json& status);

// status.world.workers: the workers the job runs with now; nullopt before the operator wrote it.
std::optional<int> WorldWorkers(const Json& status);

// status.world.members: the worker slots (ranks of their pods) of that world, ascending; the
// lowest `workers` slots when the status names none; empty before the operator wrote a world.
// A shrink keeps the lowest slots, a grow fills the lowest free ones, so only a lost worker
// leaves a gap (docs/elastic.md#losing-a-worker).
std::vector<int> WorldMembers(const Json& status);

// The worker slots whose pods a round of `job` wants (`spec`: WorldSpec's): the world's members
// and, while a grow is under way, the slots it brings in (the lowest outside the world, as the
// job's scheduler picks them); 0..replicas-1 for a job without a world or while it is suspended.
std::vector<int> WorkerSlots(const JobSpec& spec, const Json& job);

// A worker pod of an elastic job that failed and whose agent said the job's scheduler lost it
// for good (its termination report's `lost`): the job goes on without it, and no pod is made
// again for its slot unless a grow brings the slot back.
bool LostWorker(const JobSpec& spec, const ObservedPod& p);

// Lost workers of the world not noted yet: each goes into status.world.lost {worker, pod,
// reason, time} with a WorkerLost Warning event, and the loss is followed as a resize
// (status.lastResize {from, to, reason "worker N lost", lostWorker, generation} Pending, the
// Resizing condition True) until the scheduler's world no longer has it; the world it leaves
// runs on until the job's spec changes (PlanResize does not ask for the replicas again).
void NoteLostWorkers(PlanRound& r);

// One loss into `st` (a job's status) as NoteLostWorkers notes it: worker `slot` of `job`, its
// pod `pod`, lost for `why` (the scheduler's words), while the job's metadata.generation is
// `generation`; `silent` (LostWorker.silent): its pod may still run, frozen, and the entry says
// so (PlanPods deletes such a pod). Returns the WorkerLost event's message; "" when the slot is
// not in the world or was noted already. The progress poller notes this way the losses the
// scheduler's view lists that no failed pod tells of (a worker silent past
// registrationTimeoutSeconds).
std::string NoteLoss(Json& st, const std::string& job, int slot, const std::string& pod, const std::string& why,
                     bool silent, int64_t generation, Clock::time_point now);
// The job's scheduler grows the world back on its own when a lost worker's program comes back
// and asks to join (a late replacement; scheduler/world_plan.h GrowBack). The progress poller
// notes it in `st` from the scheduler's progress `p`: a grow under way as status.lastResize
// Pending (the reconciler follows it as any resize, the joiner's pod wanted meanwhile) with a
// WorkerBack event, or, decided between two polls already, Done with the new world and a Resized
// event. nullopt: nothing of the kind (a resize the operator follows already, a loss).
std::optional<JobPlan::Event> NoteSchedulersGrow(Json& st, const std::string& job, const v1::JobProgress& p,
                                                Clock::time_point now);

// status.world.lost: the workers lost for good that no later world brought back, oldest first
// (`silent_only`: those lost while silent).
std::vector<int> LostSlots(const Json& st, bool silent_only = false);
// status.world.lost names `slot` as lost while silent.
bool LostSilently(const Json& status, int slot);
// The uid of the silent worker `slot`'s pod the operator deleted (NoteSilentPodDeleted notes it
// in its status.world.lost entry as deletedPodUid), "" while it has deleted none: any other pod
// of that name is its replacement.
std::string DeletedSilentPod(const Json& status, int slot);
void NoteSilentPodDeleted(Json& status, int slot, const std::string& uid);

// The spec the plan works with for `job` (`spec`: its parsed spec): a job that has a world gets
// the world's replicas, so the desired pods are the ones that train now; while it is suspended,
// the replicas asked for (for an elastic job, when they are within spec.elastic): its next run
// starts at that size.
JobSpec WorldSpec(const JobSpec& spec, const Json& job);

// A job whose spec ParseJobSpec refused with `error`: when it is an elastic job that runs in a
// world and only its spec.workers.replicas is outside spec.elastic's bounds (a `kubectl scale`
// too far), the spec with the world's replicas (the job keeps running; PlanResize refuses the
// ask on the job). Otherwise `error`.
StatusOr<JobSpec> ParseAtWorldReplicas(const Json& job, const Status& error);

// The world phase of a job (PlanJob runs it last): the first round, and the first of a resumed
// run, write status.world from the spec; a running elastic job whose `asked` replicas differ from
// its world gets plan.resize (or a refusal on the job when outside spec.elastic); a job without
// spec.elastic gets a refusal on the job (its size changes only when it next starts); a resize
// under way sets plan.follow_resize. A refusal or an abandoned resize is not asked again until
// the replicas change. `asked_servers` (spec.servers.replicas) other than the run's servers
// (status.world.servers) gets plan.resize of the servers (ResizeAsk.servers; once the workers
// are as asked: one kind at a time) when `servers_elastic` (spec.elastic sets minServers or
// maxServers) and it is within them; otherwise it is refused on the job, once.
void PlanResize(PlanRound& r, int asked, int asked_servers, bool servers_elastic);

// The job ended, or was suspended (`why`), with a resize Pending: it will not take effect; it is
// Abandoned and the Resizing condition False. Nothing otherwise (idempotent: every round of an
// ended job runs it).
void EndResize(Json& status, const std::string& job, const std::string& why, Clock::time_point now);

// The scheduler's answer to plan.resize for `job` (its name; `pending_epoch`: the epoch of a resize the scheduler
// already has under way, from its progress, when it answered FAILED_PRECONDITION; 0: none):
// status.lastResize Pending with the Resizing condition True, or Refused with the scheduler's
// reason. Returns false when the answer says nothing yet (the scheduler could not be reached):
// ask again later. Events go to `events`.
bool ApplyResizeAnswer(Json& status, const std::string& job, const ResizeAsk& ask,
                       const StatusOr<v1::ResizeResponse>& answer, int64_t pending_epoch, Clock::time_point now, std::vector<JobPlan::Event>* events);

// The scheduler's progress while a resize is Pending: once its world reached the resize's epoch,
// status.world is the new world and the resize Done (the Resizing condition False, a Resized
// event); if the scheduler no longer has it under way, Abandoned. Returns whether it is still
// Pending.
bool ApplyResizeProgress(Json& status, const std::string& job, const v1::JobProgress& p, Clock::time_point now,
                         std::vector<JobPlan::Event>* events);

}  // namespace trellis::op
