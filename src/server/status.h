// chimaera-ctl status: the server's state as text, or as one JSON object.
#pragma once

#include <string>

namespace chi {

class Service;

std::string status_text(Service &service, bool json);

}  // namespace chi
