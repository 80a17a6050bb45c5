// A server's data address (datapath/address.h): parsed once, written back the same, hostile
// text refused with a reason that is cut and printable; and the local socket's names.
#include "datapath/address.h"

#include <unistd.h>

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "datapath/tcp/wire.h"

namespace trellis {
namespace {

TEST(DataAddress, ParsesAndWritesBack) {
  auto a = DataAddress::Parse("10.0.0.5:4100;tcp=4101");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->service, "10.0.0.5:4100");
  EXPECT_EQ(a->tcp_port, 4101);
  EXPECT_EQ(a->local_name, "");
  auto plain = DataAddress::Parse("h:1");
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->service, "h:1");
  EXPECT_EQ(plain->tcp_port, 0);
  EXPECT_EQ((DataAddress{"h:1", 2, ""}.ToString()), "h:1;tcp=2");
  EXPECT_EQ((DataAddress{"h:1", 0, ""}.ToString()), "h:1");
  auto bad = DataAddress::Parse("h:1;tcp=70000");
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("tcp port '70000'"), std::string::npos)
      << bad.status().ToString();
  EXPECT_FALSE(DataAddress::Parse("no-port").ok());
}

TEST(DataAddress, CarriesTheLocalSocketsName) {
  const std::string name = *NewLocalName();
  EXPECT_TRUE(CheckLocalName(name).ok()) << name;
  EXPECT_NE(name, *NewLocalName());  // fresh each time
  const std::string joined = DataAddress{"h:1", 2, name}.ToString();
  EXPECT_EQ(joined, "h:1;tcp=2;local=" + name);
  auto a = DataAddress::Parse(joined);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->service, "h:1");
  EXPECT_EQ(a->tcp_port, 2);
  EXPECT_EQ(a->local_name, name);
  EXPECT_EQ(DataAddress::Parse("h:1;tcp=2")->local_name, "");
  EXPECT_EQ((DataAddress{"h:1", 0, name}.ToString()), "h:1");  // no TCP port, no local socket
  // Hostile or broken names are refused with the reason, never truncated or used.
  const std::vector<std::string> hostile = {
      "h:1;tcp=2;local=", "h:1;tcp=2;local=../x", "h:1;tcp=2;local=a b",
      "h:1;tcp=2;local=" + std::string(40 << 10, 'a'), "h:1;local=" + name,
      // Only names of our own form: not another program's socket, not a near miss.
      "h:1;tcp=2;local=dbus-session", "h:1;tcp=2;local=" + name.substr(0, name.size() - 1),
      "h:1;tcp=2;local=TRELLIS-" + name.substr(8), "h:1;tcp=2;local=" + name + "\n\x1b[31m"};
  for (const std::string& text : hostile) {
    Status st = DataAddress::Parse(text).status();
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << text.substr(0, 60);
    EXPECT_LT(st.message().size(), 400u);  // the address cut, not echoed whole
  }
  EXPECT_NE(DataAddress::Parse("h:1;local=" + name).status().message().find(
                "a local socket without a tcp port"),
            std::string::npos);
  const std::string msg = CheckLocalName(name + "\n\x1b[31m").message();
  EXPECT_NE(msg.find("is not trellis- and 32 lowercase hex digits"), std::string::npos) << msg;
  EXPECT_EQ(msg.find_first_of("\n\x1b"), std::string::npos) << "control bytes reached a message";
}

TEST(LocalSocket, ANameInUseCannotBeTakenTwiceAndNobodyListeningIsUnavailable) {
  const std::string name = *NewLocalName();
  auto first = tcpwire::ListenLocal(name);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_FALSE(tcpwire::ListenLocal(name).ok());  // no two servers share one
  ::close(*first);
  EXPECT_EQ(tcpwire::ConnectLocal(name).status().code(), StatusCode::kUnavailable);
}

}  // namespace
}  // namespace trellis
