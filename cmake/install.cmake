# `cmake --install BUILD [--prefix P]` (default prefix /usr/local):
#   P/bin/mgn                              the command line
#   P/lib/libmgn.a                         the library (static; its link dependencies travel with the target)
#   P/include/mgn/*.h                      the public headers
#   P/lib/cmake/meganeura/                 find_package(meganeura) -> meganeura::mgn
#   P/lib/pkgconfig/meganeura.pc           pkg-config --cflags --libs meganeura
#   P/lib/python3.X/dist-packages/meganeura   the Python module (python/CMakeLists.txt)
include(CMakePackageConfigHelpers)

install(TARGETS mgn_tool RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS mgn EXPORT meganeuraTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(DIRECTORY include/mgn DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

# The static library's private dependencies (zlib, protobuf and ONNX's generated proto, Vulkan, the shader
# compiler archives, the audio and image libraries as absolute paths) are in the exported target's link interface; the package config finds them again.
install(EXPORT meganeuraTargets NAMESPACE meganeura:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/meganeura)
configure_package_config_file(cmake/meganeuraConfig.cmake.in ${CMAKE_BINARY_DIR}/meganeuraConfig.cmake
                              INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/meganeura)
write_basic_package_version_file(${CMAKE_BINARY_DIR}/meganeuraConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/meganeuraConfig.cmake ${CMAKE_BINARY_DIR}/meganeuraConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/meganeura)

# pkg-config: the library is static, so Libs names everything it needs.
set(MGN_PC_LIBS "-lmgn")
if(MGN_VULKAN)
  foreach(lib ${MGN_SHADER_LIBS})
    string(APPEND MGN_PC_LIBS " ${lib}")
  endforeach()
  string(APPEND MGN_PC_LIBS " -lvulkan")
  set(MGN_PC_CFLAGS "-DMGN_HAVE_VULKAN=1")
endif()
string(APPEND MGN_PC_LIBS " -lonnx_proto -lprotobuf")
# libsndfile, libsamplerate, FFTW; libjpeg, libpng, libwebp (pkg-config paths)
foreach(lib ${MGN_AUDIO_LINK_LIBRARIES} ${MGN_IMAGE_LINK_LIBRARIES})
  string(APPEND MGN_PC_LIBS " ${lib}")
endforeach()
string(APPEND MGN_PC_LIBS " -lz -lpthread")
file(RELATIVE_PATH MGN_PC_UP /p/${CMAKE_INSTALL_LIBDIR}/pkgconfig /p)
configure_file(cmake/meganeura.pc.in ${CMAKE_BINARY_DIR}/meganeura.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/meganeura.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
