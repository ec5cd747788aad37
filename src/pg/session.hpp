// Backend services the filing code needs beyond SPI: settings scoped to a piece of work, and log
// lines. Each call guarded.
#pragma once

#include <functional>
#include <string>

namespace magic_sync::pg {

// Opens a level for setting changes (as a function with a SET clause does); returns it.
int open_settings_level();
// Undoes every setting changed since `level` opened, SET LOCAL included (the role, what a filing
// hook set for row policies), and closes it.
void undo_settings(int level);

// Runs `work` as the owner of schema sync (who created the extension), as a SECURITY DEFINER
// function runs its body: sync.receive calls its helpers so, and its caller, who may execute
// sync.receive alone, never can. The caller's role comes back however `work` ends.
void as_extension_owner(const std::function<void()>& work);

// Writes `line` to the server log (LOG).
void log_line(const std::string& line);
// Raises a WARNING (the server log and the client), with a hint of what to do.
void warning(const std::string& message, const std::string& hint);

}  // namespace magic_sync::pg
