// StepProfile's arithmetic: phases add only while active, "other" is the step's time the
// phases leave, wall and CPU apart.
#include <gtest/gtest.h>

#include "examples/gpt/step_profile.hpp"

using gpt::StepProfile;

TEST(StepProfile, CountsOnlyWhileActiveAndOtherIsTheRest) {
  StepProfile p;
  const StepProfile::Stamp t0{10.0, 1.0}, t1{10.5, 1.25}, t2{11.0, 1.5};
  p.add(StepProfile::head, t0, t1);  // inactive: not counted
  p.add_step(t0, t2);
  EXPECT_EQ(p.steps(), 0);
  p.active = true;
  p.add(StepProfile::head, t0, t1);
  p.add(StepProfile::engine_step, t1, {10.75, 1.25});
  p.add_step(t0, t2);
  EXPECT_EQ(p.steps(), 1);
  EXPECT_DOUBLE_EQ(p.seconds(StepProfile::head), 0.5);
  EXPECT_DOUBLE_EQ(p.seconds(StepProfile::head, true), 0.25);
  EXPECT_DOUBLE_EQ(p.seconds(StepProfile::engine_step), 0.25);
  EXPECT_DOUBLE_EQ(p.seconds(StepProfile::engine_step, true), 0.0);
  EXPECT_DOUBLE_EQ(p.seconds(StepProfile::other), 0.25);        // 1.0 - 0.5 - 0.25
  EXPECT_DOUBLE_EQ(p.seconds(StepProfile::other, true), 0.25);  // 0.5 - 0.25 - 0
  EXPECT_DOUBLE_EQ(p.seconds(StepProfile::blocks_forward), 0.0);
}
