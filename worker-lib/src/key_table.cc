#include "worker-lib/src/key_table.h"

#include <string>

namespace trellis {
namespace {

v1::DType ToProto(DType d) { return d == DType::kFloat32 ? v1::DTYPE_FLOAT32 : v1::DTYPE_UNSPECIFIED; }

}  // namespace

KeyTable::KeyTable(int32_t num_servers, int64_t slice_bytes_override,
                   ChooseEncoding choose_encoding)
    : num_servers_(num_servers),
      slice_bytes_override_(slice_bytes_override),
      choose_encoding_(std::move(choose_encoding)) {}

Status KeyTable::DeclareKey(const KeyDecl& key) {
  MutexLock lock(&decl_mu_);
  const std::string name = KeyName(key);
  if (key.num_elements < 1) {
    return InvalidArgumentError("DeclareKey " + name + ": num_elements must be >= 1, got " +
                                std::to_string(key.num_elements));
  }
  if (key.dtype != DType::kFloat32) {
    return InvalidArgumentError("DeclareKey " + name + ": only float32 is supported");
  }
  if (declared_.count(key.id)) {
    return AlreadyExistsError("DeclareKey " + name + ": key id declared twice");
  }
  declared_[key.id] = key;
  if (finished_.load()) {
    WriterMutexLock keys_lock(&keys_mu_);
    late_.insert(key.id);
  }
  return Status::Ok();
}

Status KeyTable::FinishDeclarations(const Declare& declare, const Install& install) {
  MutexLock lock(&decl_mu_);
  const bool first = !finished_.load();
  std::vector<KeyId> added;  // declared since the last round
  for (const auto& entry : declared_) {
    if (first || Find(entry.first) == nullptr) added.push_back(entry.first);
  }
  if (declared_.empty()) return FailedPreconditionError("FinishDeclarations: no keys declared");
  if (added.empty()) {
    return FailedPreconditionError("FinishDeclarations: no keys declared since the last call");
  }
  Status st = RoundLocked(first, declare, install);
  if (!first) {
    // Done with these either way; after a failed round (another worker did not declare the
    // same keys) they are undeclared again, and the program may declare again.
    WriterMutexLock keys_lock(&keys_mu_);
    for (KeyId id : added) {
      late_.erase(id);
      if (!st.ok()) declared_.erase(id);
    }
  }
  return st;
}

Status KeyTable::RoundLocked(bool first, const Declare& declare, const Install& install) {
  std::vector<v1::KeySpec> specs;
  specs.reserve(declared_.size());
  for (const auto& [id, d] : declared_) {
    v1::KeySpec s;
    s.set_id(id);
    s.set_name(d.name);
    s.set_num_elements(d.num_elements);
    s.set_dtype(ToProto(d.dtype));
    specs.push_back(std::move(s));
  }
  TRELLIS_ASSIGN_OR_RETURN(v1::ShardMap map, declare(specs));
  if (slice_bytes_override_ > 0 && slice_bytes_override_ != map.slice_bytes()) {
    return InvalidArgumentError(
        "slice_bytes " + std::to_string(slice_bytes_override_) +
        " set for this worker differs from the job's sliceBytes " +
        std::to_string(map.slice_bytes()) + " (the scheduler's shard map is shared by all)");
  }
  if (map.num_servers() != num_servers_) {
    return InternalError("shard map is for " + std::to_string(map.num_servers()) +
                         " servers, the cluster has " + std::to_string(num_servers_.load()));
  }
  TRELLIS_ASSIGN_OR_RETURN(std::vector<std::unique_ptr<KeyState>> fresh, PlaceLocked(map, first));
  TRELLIS_RETURN_IF_ERROR(install(map, first));
  {
    WriterMutexLock keys_lock(&keys_mu_);
    for (auto& k : fresh) {
      const KeyId id = k->decl.id;
      keys_[id] = std::move(k);
    }
  }
  finished_.store(true);
  return Status::Ok();
}

StatusOr<std::vector<std::unique_ptr<KeyState>>> KeyTable::PlaceLocked(const v1::ShardMap& map,
                                                                      bool first) {
  std::vector<std::unique_ptr<KeyState>> fresh;
  for (const auto& ks : map.keys()) {
    auto d = declared_.find(ks.key().id());
    if (d == declared_.end()) {
      return InternalError("shard map has key " + std::to_string(ks.key().id()) +
                           " this worker did not declare");
    }
    if (!first && Find(d->first) != nullptr) continue;
    auto k = std::make_unique<KeyState>();
    k->decl = d->second;
    TRELLIS_RETURN_IF_ERROR(choose_encoding_(k.get()));
    int64_t next = 0;
    for (const auto& sa : ks.slices()) {
      if (sa.offset() != next || sa.num_elements() < 1 || sa.server() < 0 ||
          sa.server() >= num_servers_) {
        return InternalError("shard map: bad slice " + std::to_string(sa.index()) + " of " +
                             KeyName(k->decl));
      }
      k->slices.push_back({sa.index(), sa.offset(), sa.num_elements(), sa.server()});
      next += sa.num_elements();
    }
    if (next != k->decl.num_elements) {
      return InternalError("shard map covers " + std::to_string(next) + " elements of " +
                           KeyName(k->decl) + ", declared " +
                           std::to_string(k->decl.num_elements));
    }
    fresh.push_back(std::move(k));
  }
  if (static_cast<size_t>(map.keys_size()) != declared_.size()) {
    return InternalError("shard map lacks some of the " + std::to_string(declared_.size()) +
                         " declared keys");
  }
  return fresh;
}

StatusOr<std::vector<KeyTable::SliceMoveOf>> KeyTable::Relayout(const v1::ShardMap& map) {
  MutexLock lock(&decl_mu_);
  WriterMutexLock keys_lock(&keys_mu_);
  if (static_cast<size_t>(map.keys_size()) != keys_.size()) {
    return InternalError("server resize: the shard map has " + std::to_string(map.keys_size()) +
                         " keys, this worker placed " + std::to_string(keys_.size()));
  }
  // Checked whole before anything changes.
  for (const auto& ks : map.keys()) {
    auto it = keys_.find(ks.key().id());
    const KeyState* k = it == keys_.end() ? nullptr : it->second.get();
    bool same = k != nullptr && static_cast<size_t>(ks.slices_size()) == k->slices.size();
    for (int j = 0; same && j < ks.slices_size(); ++j) {
      const auto& sa = ks.slices(j);
      same = sa.index() == k->slices[j].index && sa.offset() == k->slices[j].offset &&
             sa.num_elements() == k->slices[j].num_elements && sa.server() >= 0 &&
             sa.server() < map.num_servers();
    }
    if (!same) {
      return InternalError("server resize: the shard map lays key " + std::to_string(ks.key().id()) +
                           " out otherwise than this worker placed it");
    }
  }
  std::vector<SliceMoveOf> moves;
  for (const auto& ks : map.keys()) {
    KeyState& k = *keys_.at(ks.key().id());
    for (int j = 0; j < ks.slices_size(); ++j) {
      SliceInfo& slice = k.slices[j];
      if (slice.server == ks.slices(j).server()) continue;
      moves.push_back({&k, slice.index, slice.server, ks.slices(j).server()});
      slice.server = ks.slices(j).server();
    }
  }
  num_servers_.store(map.num_servers());
  return moves;
}

KeyState* KeyTable::Find(KeyId key) const {
  ReaderMutexLock keys_lock(&keys_mu_);
  auto it = keys_.find(key);
  return it == keys_.end() ? nullptr : it->second.get();
}

bool KeyTable::Late(KeyId key) const {
  ReaderMutexLock keys_lock(&keys_mu_);
  return late_.count(key) != 0;
}

std::vector<std::pair<KeyId, int64_t>> KeyTable::PushSteps() const {
  ReaderMutexLock keys_lock(&keys_mu_);
  std::vector<std::pair<KeyId, int64_t>> out;
  out.reserve(keys_.size());
  for (const auto& [id, k] : keys_) out.emplace_back(id, k->push_step.load());
  return out;
}

Status KeyTable::SetPushSteps(const std::vector<std::pair<KeyId, int64_t>>& steps) {
  ReaderMutexLock keys_lock(&keys_mu_);
  for (const auto& [id, step] : steps) {
    auto it = keys_.find(id);
    if (it == keys_.end()) {
      return FailedPreconditionError("rejoin: the donor has key " + std::to_string(id) +
                                     " that this worker did not declare");
    }
    if (step < 0) {
      return InvalidArgumentError("rejoin: step " + std::to_string(step) + " for key " +
                                  std::to_string(id));
    }
  }
  for (const auto& [id, step] : steps) keys_.at(id)->push_step.store(step);
  return Status::Ok();
}

}  // namespace trellis
