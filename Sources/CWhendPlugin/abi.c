/* The ABI is the header; this file exists so that the header has a target. */
