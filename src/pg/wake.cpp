#include "pg/wake.hpp"

extern "C" {
#include "postgres.h"

#include "access/xact.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/proc.h"
#include "storage/shmem.h"
#include "storage/spin.h"
}

#include "pg/bridge.hpp"

namespace magic_sync::pg {

namespace {

constexpr int kSlots = 64;  // databases with a relay at once

struct Slot {
    Oid database;
    int pid;
    Latch* latch;
};

struct Shared {
    slock_t mutex;
    Slot slots[kSlots];
};

Shared* shared = nullptr;
shmem_request_hook_type previous_request_hook = nullptr;
shmem_startup_hook_type previous_startup_hook = nullptr;
bool wake_at_commit = false;
bool registered = false;
bool has_slot = false;  // this session's latch is in shared memory

void request_shared_memory() {
    if (previous_request_hook != nullptr) previous_request_hook();
    RequestAddinShmemSpace(sizeof(Shared));
}

void start_shared_memory() {
    if (previous_startup_hook != nullptr) previous_startup_hook();
    LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
    bool found = false;
    shared = static_cast<Shared*>(ShmemInitStruct("magic_sync relay", sizeof(Shared), &found));
    if (!found) {
        SpinLockInit(&shared->mutex);
        for (Slot& slot : shared->slots) slot = Slot{InvalidOid, 0, nullptr};
    }
    LWLockRelease(AddinShmemInitLock);
}

void set_relay_latch() {
    if (shared == nullptr || !OidIsValid(MyDatabaseId)) return;
    SpinLockAcquire(&shared->mutex);
    for (Slot& slot : shared->slots)
        if (slot.database == MyDatabaseId && slot.latch != nullptr) SetLatch(slot.latch);
    SpinLockRelease(&shared->mutex);
}

void at_transaction_end(XactEvent event, void*) {
    if (event == XACT_EVENT_COMMIT && wake_at_commit) set_relay_latch();
    if (event == XACT_EVENT_COMMIT || event == XACT_EVENT_ABORT ||
        event == XACT_EVENT_PARALLEL_COMMIT || event == XACT_EVENT_PARALLEL_ABORT)
        wake_at_commit = false;
}

void unregister_relay_latch(int, Datum) {
    if (shared == nullptr) return;
    SpinLockAcquire(&shared->mutex);
    for (Slot& slot : shared->slots)
        if (slot.pid == MyProcPid) slot = Slot{InvalidOid, 0, nullptr};
    SpinLockRelease(&shared->mutex);
}

}  // namespace

void define_wake(bool preloaded) {
    if (preloaded) {
        previous_request_hook = shmem_request_hook;
        shmem_request_hook = request_shared_memory;
        previous_startup_hook = shmem_startup_hook;
        shmem_startup_hook = start_shared_memory;
    }
    RegisterXactCallback(at_transaction_end, nullptr);
}

void wake_relay_at_commit() { wake_at_commit = true; }

void register_relay_latch() {
    if (shared == nullptr || registered) return;
    guard([]() noexcept {
        SpinLockAcquire(&shared->mutex);
        Slot* free_slot = nullptr;
        for (Slot& slot : shared->slots)
            if (slot.latch == nullptr && free_slot == nullptr) free_slot = &slot;
        if (free_slot != nullptr) *free_slot = Slot{MyDatabaseId, MyProcPid, &MyProc->procLatch};
        has_slot = free_slot != nullptr;
        SpinLockRelease(&shared->mutex);
        if (free_slot == nullptr)
            ereport(WARNING, (errmsg("magic_sync: more than %d relays; commits will not wake this "
                                     "one, it polls every magic_sync.idle",
                                     kSlots)));
        before_shmem_exit(unregister_relay_latch, 0);
    });
    registered = true;
}

bool relay_can_be_woken() { return has_slot; }

}  // namespace magic_sync::pg
