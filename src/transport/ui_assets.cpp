// ui_assets.cpp: finding the /ui page's built-in files by path.
#include "transport/ui_assets.h"

namespace sluice::transport {

const EmbeddedFile* ui_file(std::string_view path) noexcept {
  if (path == "/ui" || path == "/ui/") path = "/ui/index.html";
  if (!path.starts_with("/ui/")) return nullptr;
  path.remove_prefix(4);
  for (const EmbeddedFile& f : ui_files())
    if (f.name == path) return &f;
  return nullptr;
}

std::string_view ui_content_type(std::string_view name) noexcept {
  if (name.ends_with(".html")) return "text/html; charset=utf-8";
  if (name.ends_with(".js")) return "text/javascript; charset=utf-8";
  if (name.ends_with(".css")) return "text/css; charset=utf-8";
  if (name.ends_with(".svg")) return "image/svg+xml";
  if (name.ends_with(".png")) return "image/png";
  return "application/octet-stream";
}

}  // namespace sluice::transport
