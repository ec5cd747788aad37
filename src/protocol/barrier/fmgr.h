#error "src/protocol/ is pure C++ shared with sender/ and replica/: it must not include fmgr.h"
