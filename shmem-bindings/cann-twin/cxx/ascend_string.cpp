// libmetadef.so of the twin: ge::AscendString's out-of-line members (docs/mooncake-npu-wheel.md section 6).
#include <cstring>

#include "twin_cann.h"

namespace ge {
AscendString::AscendString(const char *name) {
    if (name != nullptr) {
        name_ = std::make_shared<std::string>(name);
    }
}

const char *AscendString::GetString() const {
    return name_ ? name_->c_str() : "";
}

size_t AscendString::GetLength() const {
    return name_ ? name_->size() : 0;
}

bool AscendString::operator<(const AscendString &other) const {
    if (!name_) {
        return static_cast<bool>(other.name_);
    }
    if (!other.name_) {
        return false;
    }
    return *name_ < *other.name_;
}

bool AscendString::operator==(const AscendString &other) const {
    return std::strcmp(GetString(), other.GetString()) == 0;
}
}  // namespace ge
