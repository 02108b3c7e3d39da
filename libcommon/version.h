/* version.h — the ftk version, recorded in every file ftk writes. */
#ifndef FTK_VERSION_H
#define FTK_VERSION_H
#define FTK_VERSION "0.1.0"
#endif
