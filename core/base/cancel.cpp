#include "core/base/cancel.h"

namespace batchpilot::core {
namespace {
thread_local const std::atomic<bool>* t_flag = nullptr;
}  // namespace

CancelScope::CancelScope(const std::atomic<bool>& flag) : m_previous(t_flag) {
    t_flag = &flag;
}
CancelScope::~CancelScope() {
    t_flag = m_previous;
}

const std::atomic<bool>* cancelFlag() {
    return t_flag;
}

}  // namespace batchpilot::core
