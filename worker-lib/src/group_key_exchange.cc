#include "worker-lib/src/group_key_exchange.h"

namespace trellis {

GroupKeyExchange SchedulerGroupKeyExchange(std::shared_ptr<SchedulerClient> client,
                                           std::chrono::milliseconds wait) {
  return [client = std::move(client), wait](const std::string& group, int rank,
                                            const std::string& key) -> StatusOr<std::string> {
    if (rank == 0) {
      TRELLIS_RETURN_IF_ERROR(client->PublishGroupKey(group, key));
      return key;
    }
    return client->GetGroupKey(group, wait);
  };
}

}  // namespace trellis
