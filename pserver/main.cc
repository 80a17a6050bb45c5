// trellis-pserver: one parameter server rank. See pserver/pserver_main.h.
#include "pserver/pserver_main.h"

int main(int argc, char** argv) { return trellis::PserverMain(argc, argv); }
