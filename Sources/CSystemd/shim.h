#ifndef WHEND_CSYSTEMD_SHIM_H
#define WHEND_CSYSTEMD_SHIM_H
#include <systemd/sd-daemon.h>
#endif
